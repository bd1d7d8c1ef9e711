"""Model building: the tiny Qwen2-architecture policy and its tokenizer, made offline."""
