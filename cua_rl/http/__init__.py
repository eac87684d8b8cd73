"""What every HTTP service and client of the project shares: ``input`` (body-size caps and bounded JSON for
the servers), ``retry`` (bounded retries with backoff for the clients), ``serve`` (an ASGI app on a
background thread, on a loopback port), ``auth`` (the gym's and agent service's bearer tokens and JSON-only state
changes, for both servers and their clients)."""
