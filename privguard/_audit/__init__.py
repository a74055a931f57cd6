"""The one-run audit's arithmetic: the Steinke–Nasr–Jagielski lower bound, the guess rule and the canaries' scores (privguard.audit runs the training)."""
