"""The recipes (config*.yaml, .env.example) as package data: a config of your own starts from one with
``hydra: {searchpath: [pkg://cua_rl.recipes]}`` and ``defaults: [config.cpu, _self_]``."""
