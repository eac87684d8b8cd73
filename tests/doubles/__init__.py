"""What the tests share across folders: the test doubles of the services and engines we talk to
(``genv_double``, ``agent_double``, ``model_double``, ``monitor_double``, ``policy_helpers.EngineDouble``)
and the real embedded stack as a fixture (``embedded_stack``). Import them as ``tests.doubles.<module>``."""
