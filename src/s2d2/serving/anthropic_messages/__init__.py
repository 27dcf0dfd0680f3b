"""Anthropic's Messages API (``POST /v1/messages`` and ``POST /v1/messages/count_tokens``) on the chat
completions machinery: the request's checks and its translation into a chat request (:mod:`.request`,
its messages :mod:`.blocks`, its tools :mod:`.tools`), the message and its streamed events
(:mod:`.reply`), the endpoint's work (:mod:`.serve`) and Anthropic's error shape (:mod:`.errors`)."""
