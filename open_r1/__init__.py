"""GRPO for small vision-language models on counting VQA (Qwen2-VL), built on TRL."""
