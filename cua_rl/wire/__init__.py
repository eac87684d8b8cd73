"""The wire contracts of our services, each written once: the shapes that a client sends and a server accepts.

Why a room of its own on the ground floor: a contract declared twice (a client's dataclass and a server's
pydantic model) drifts one field at a time; here both ends import the one class, so a field, its JSON name, its
default and its bounds are stated in one place. A server may validate more strictly by subclassing a contract
only to add validators (never fields). :mod:`.agent`: the agent service's ``POST /runs`` body.
"""
