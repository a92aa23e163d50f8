"""Agent frameworks made durable, one module per framework, each imported only when used:

- :mod:`durable_nb.integrations.openai_agents`: the OpenAI Agents SDK (``pip install
  durable-nb[agents]``);
- :mod:`durable_nb.integrations.pydantic_ai`: Pydantic AI (``pip install
  durable-nb[pydantic-ai]``).
"""
