"""The forecasting agent: prompts, answer and action parsing, tools, the multi-turn loop."""
