from slurmhet.cli import main

main()
