"""The text layer: tokenizer and vocabularies, chat templates, the reply parser and its events, stop
strings. It turns messages into token ids and token ids back into reasoning, content and tool calls,
and knows nothing of the engine."""
