"""OpenAI's Responses API (``POST /v1/responses``) on the chat completions machinery: the request
(:mod:`.request`), the response object and its events (:mod:`.reply`), the endpoint's work (:mod:`.serve`)."""
