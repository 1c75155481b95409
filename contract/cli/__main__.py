from contract.cli import main

main()
