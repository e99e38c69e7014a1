"""The lease service: the protocol's transactions (acquire, renew, release, reclaim), the read of the
store into verified views, and the audit log written in the same transaction as every reclaim.
Stands on gitlease.core and gitlease.identity.
"""
