"""Thin Ray actor shells around cast_rl library objects."""
