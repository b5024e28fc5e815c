"""The embedded model's lab: its scenes (drawn and judged), its training, its evaluation and its example LoRAs."""
