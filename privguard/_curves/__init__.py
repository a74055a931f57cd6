"""The maths of RDP curves: the grid of orders, conversion to (ε, δ), the subsampled Gaussian's series."""
