"""Counting that generalizes: the grader protocol, rewards, data validation, evaluation and the scene renderer."""
