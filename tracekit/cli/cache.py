"""``tracekit cache info`` / ``tracekit cache clear``: the directory of decompressed and converted exports
(``tracekit.readers.cache``: bounded by ``$TRACEKIT_CACHE_MAX``, least recently used entries evicted first)."""

from __future__ import annotations

import json

import click

from tracekit.text import size


@click.group("cache")
def cache():
    """The cache of decompressed .sqlite.gz and converted .nsys-rep exports.

    Where: $TRACEKIT_CACHE, else ~/.cache/tracekit. Size cap: $TRACEKIT_CACHE_MAX (default 4GB); the least
    recently used entries are removed first.
    """


@cache.command("info")
@click.option("--format", "fmt", type=click.Choice(("table", "json")), default="table", show_default=True,
              help="Output format.")
def info(fmt):
    """Where the cache is, what it holds and its size cap."""
    from tracekit.readers.cache import info as cache_info

    d = cache_info()
    if fmt == "json":
        click.echo(json.dumps(d, indent=2))
        return
    click.echo(f"{d['dir']}: {len(d['entries'])} entries, {size(d['bytes'])} of a {size(d['max_bytes'])} cap "
               "(TRACEKIT_CACHE_MAX)")
    for e in d["entries"]:
        click.echo(f"  {size(e['bytes']):>9}  {e['last_used']}  {e['name']}")


@cache.command("clear")
def clear():
    """Remove every entry (they are made again, once, when their trace is next read)."""
    from tracekit.readers.cache import cache_dir
    from tracekit.readers.cache import clear as cache_clear

    n, freed = cache_clear()
    click.echo(f"removed {n} file{'s' if n != 1 else ''} ({size(freed)}) from {cache_dir()}")


COMMANDS = (cache,)
