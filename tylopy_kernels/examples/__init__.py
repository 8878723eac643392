"""Small complete kernels written with the public ``ty.*`` names only: start reading here."""
