"""Model helpers: offline tiny models, chat formatting."""
