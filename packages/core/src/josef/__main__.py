from josef.cli import main

main()
