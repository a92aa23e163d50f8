"""The HTTP library the installed openai client is built on (httpx for openai 1.x and 2.x,
httpx2 for 3.x), for tests that build openai's errors from HTTP responses."""

import importlib

import openai._base_client as _base_client

HTTP = importlib.import_module("httpx2" if hasattr(_base_client, "httpx2") else "httpx")
