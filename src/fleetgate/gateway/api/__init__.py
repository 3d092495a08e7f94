"""HTTP routes: thin handlers that parse, delegate and map errors (no routing logic here)."""
