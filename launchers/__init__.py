"""Entry points: parse config, start or join Ray, run the driver."""
