"""`python -m engineroom.cli`: the console command."""

from . import main

main()
