"""Faults beyond a killed process (issue 40): each nemesis here injects one kind of fault and
heals it, alone or mixed with the others in tests/soak/fault_injection.py's run, and every
fault and what the clients saw during it goes to a history file (history.py)."""
