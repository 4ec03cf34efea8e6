"""gptcore: reproducible GPT-2 pretraining as a library of small modules plus DVC stage recipes."""
