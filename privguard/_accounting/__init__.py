"""Pure accounting: plan, configuration, δ shares, filters, hybrid, odometer, journal, the decide/apply path. No I/O, no locks."""
