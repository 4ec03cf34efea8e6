"""DVC stage entry points: each reads its params section, calls gptcore, writes its outs."""
