"""Planning a queue of tasks against the store: which can start now, which scope each should lease
(suggest), and what blocks the rest (planner).
"""
