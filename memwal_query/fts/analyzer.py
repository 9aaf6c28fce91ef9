"""Tokenize text exactly as an INVERTED index does, through Lance's own tokenizer.

pylance exposes the index's analyzer as ``lance.tokenize(text, **params)`` with the
same options ``create_scalar_index(..., "INVERTED")`` takes (base tokenizer,
lower-casing, stemming, stop words, ASCII folding, token length limit, n-grams ...).
An :class:`Analyzer` is built from the parameters stored with the base index, so
MemTable rows, unindexed rows and rows that left the index are tokenized like the
indexed ones (the tests compare token counts with the index's own ``_num_tokens``).

Example:
    >>> a = Analyzer.from_params({"base_tokenizer": "simple", "stem": True, "remove_stop_words": True})
    >>> a.tokens("The running Cats, and dogs!")
    ('run', 'cat', 'dog')
    >>> a.tokenize("The running Cats, and dogs!").positions
    (0, 1, 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import lance

from memwal_query.errors import InvalidArgumentError

__all__ = ["Analyzer", "Doc"]

# index parameters that are tokenizer options of lance.tokenize
_OPTIONS = (
    "base_tokenizer",
    "language",
    "max_token_length",
    "lower_case",
    "stem",
    "remove_stop_words",
    "custom_stop_words",
    "ascii_folding",
    "min_ngram_length",
    "max_ngram_length",
    "prefix_only",
    "split_identifiers",
    "split_on_numerics",
    "preserve_original",
    "index_operators",
)


@dataclass(frozen=True)
class Doc:
    """One tokenized document: its tokens in order and their positions."""

    tokens: tuple[str, ...]
    positions: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)


_EMPTY = Doc((), ())


@dataclass(frozen=True)
class Analyzer:
    """Lance's tokenizer configured like one INVERTED index."""

    options: tuple[tuple[str, Any], ...]
    with_position: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, object], what: str = "the index") -> Analyzer:
        """The analyzer of an index from its stored parameters.

        Raises:
            InvalidArgumentError: The index tokenizes JSON documents or list elements,
                which memwal does not merge.
        """
        if str(params.get("lance_tokenizer") or "text") != "text":
            msg = f"{what} tokenizes {params.get('lance_tokenizer')} documents; only text columns are supported"
            raise InvalidArgumentError(msg)
        if str(params.get("document_granularity") or "row") != "row":
            msg = f"{what} indexes list elements as documents; only one document per row is supported"
            raise InvalidArgumentError(msg)
        opts = tuple((k, params[k]) for k in _OPTIONS if k in params)
        return cls(opts, bool(params.get("with_position", False)))

    def tokenize(self, text: str | None) -> Doc:
        """``text`` as the index sees it (NULL and empty text: no tokens)."""
        if not text:
            return _EMPTY
        toks = lance.tokenize(text, **dict(self.options))
        return Doc(tuple(t.text for t in toks), tuple(int(t.position) for t in toks))

    def tokens(self, text: str | None) -> tuple[str, ...]:
        """The tokens of ``text`` in order."""
        return self.tokenize(text).tokens

    def query(self, text: str) -> Doc:
        """A query as Lance weighs it: repeated tokens count once per occurrence, except
        with the n-gram tokenizer, whose query n-grams count once each (measured).

        Example:
            >>> ngrams = {"base_tokenizer": "ngram", "min_ngram_length": 2, "max_ngram_length": 2}
            >>> Analyzer.from_params(ngrams).query("anana").tokens
            ('an', 'na')
        """
        doc = self.tokenize(text)
        if dict(self.options).get("base_tokenizer") != "ngram":
            return doc
        seen: dict[str, int] = {}
        for tok, pos in zip(doc.tokens, doc.positions, strict=True):
            seen.setdefault(tok, pos)
        return Doc(tuple(seen), tuple(seen.values()))

    def tokenize_all(self, texts: Iterable[str | None]) -> list[Doc]:
        """Each text tokenized."""
        return [self.tokenize(t) for t in texts]
