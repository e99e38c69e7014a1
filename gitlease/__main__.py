from gitlease.cli import main

main()
