"""synth: synthetic SFT/RL data from teacher LLM endpoints, verified and decontaminated."""
