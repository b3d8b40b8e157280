"""Stand-ins for what this workplace cannot reach (generated data, from-scratch bases); never imported by open_r1."""
