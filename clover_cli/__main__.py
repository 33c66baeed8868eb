from clover_cli.app import main

main()
