"""Hostile YAML documents shared by the tests of every door that reads YAML and by
`bench/hostile_input.py`."""


def alias_bomb(size: int = 600) -> str:
    """A "billion laughs": eleven levels of nine aliases each, 9**11 (~3e10) strings
    when expanded, padded with a comment to exactly `size` bytes."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, 11):
        lines.append(f"l{level}: &l{level} [" + ",".join([f"*l{level - 1}"] * 9) + "]")
    text = "\n".join(lines) + "\n"
    assert len(text) <= size - 2, len(text)
    return text + "#" + "x" * (size - len(text) - 2) + "\n"


def deep_nesting(depth: int = 10_000) -> str:
    """A flow sequence nested `depth` levels deep under one key."""
    return "cluster: " + "[" * depth + "]" * depth + "\n"


def plainly_invalid(size: int = 600) -> str:
    """Broken YAML (an unclosed flow sequence) of `size` bytes: the same-size baseline
    for rejecting the alias bomb."""
    text = 'cluster: ["lol", "lol"\n'
    return text + "#" + "x" * (size - len(text) - 2) + "\n"


ALIAS_BOMB = alias_bomb()
DEEP_NESTING = deep_nesting()
PLAINLY_INVALID = plainly_invalid()
