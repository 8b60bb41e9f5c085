"""querygen."""
