from ucmctl.cli import main

main()
