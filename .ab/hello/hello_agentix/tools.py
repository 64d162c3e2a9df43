"""Ordinary Python functions. Only `summarize` knows about Agentix: it opens
spans with `agentix.trace`, which the host sees as children of its own."""

import asyncio
import logging
import os
import platform
import sys


def add(a, b):
    return a + b


def word_count(text):
    logging.getLogger("hello_agentix").info("counting words in %d characters", len(text))
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts


async def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
        await asyncio.sleep(0)
    return a


async def slow_square(x, delay=0.2):
    await asyncio.sleep(delay)
    return x * x


def describe_sandbox():
    print("describe_sandbox was called")  # captured and replayed on the host
    return {
        "pid": os.getpid(),
        "hostname": platform.node(),
        "python": sys.version.split()[0],
        "sys.prefix": sys.prefix,
        "machine": platform.machine(),
        "cwd": os.getcwd(),
        "/usr/bin/python3 exists": os.path.exists("/usr/bin/python3"),
    }


def summarize(texts):
    from agentix import trace

    with trace.span("summarize", documents=len(texts)):
        total = 0
        for i, text in enumerate(texts):
            with trace.span("count-words", index=i):
                total += len(text.split())
        logging.getLogger("hello_agentix").info("summarized %d documents: %d words", len(texts), total)
    return total


def fail(message):
    raise ValueError(message)
