"""What every SQL backend shares: the programs, the dialect contract, migrations."""
