"""tapo: reinforcement learning for reasoning with tools (TAPO, ToRL, TEPO).

The library. It never imports Prefect, DVC or FastAPI: flows (`flows/`) and servers
(`sandbox/`) call into it, not the reverse.
"""
