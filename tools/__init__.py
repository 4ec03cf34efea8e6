"""Developer tools that keep the project's generated files true to the code (run from the project root)."""
