"""The ``privguard`` command: report, plot, verify, upgrade, demo, audit."""
