"""Tool calling on the server: the call formats (:mod:`.formats`), a request's tools and tool_choice
(:mod:`.request`), rendering conversations with tools (:mod:`.render`), reading calls out of the reply
(:mod:`.parser`) and the replies' chat messages and streamed deltas (:mod:`.reply`)."""
