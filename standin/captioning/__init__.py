"""The captioning stand-in: generated cartoons with simulated ratings, from-scratch bases, a simulated ratings
round, and the CPU demo (`python -m standin.captioning.demo`) that runs them around the real stages."""
