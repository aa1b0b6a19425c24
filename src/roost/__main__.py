from roost.cli import main

main()
