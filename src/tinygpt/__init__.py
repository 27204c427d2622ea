"""tinygpt: the package built, one concept at a time, by the book *Build a GPT from scratch*.

Each module holds one concept of the book; chapters import from here instead of copying code.
"""

__version__ = "0.1.0"
