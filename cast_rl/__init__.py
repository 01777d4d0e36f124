"""cast_rl: critique-aware supervision for training reliable long-horizon tool-calling agents."""

__version__ = "0.1.0"
