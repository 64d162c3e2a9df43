"""Ordinary Python functions; nothing here knows about Agentix."""

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
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "cwd": os.getcwd(),
    }


def fail(message):
    raise ValueError(message)
