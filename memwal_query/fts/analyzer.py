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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import Any

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memwal_query.errors import InvalidArgumentError

__all__ = ["Analyzer", "Doc", "Tokens"]

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

    @cached_property
    def counts(self) -> dict[str, int]:
        """How often each token occurs (computed once per document)."""
        out: dict[str, int] = {}
        for t in self.tokens:
            out[t] = out.get(t, 0) + 1
        return out


_EMPTY = Doc((), ())
#: Word tokenizers: a token never spans whitespace, so texts joined by a separator word
#: tokenize like each text alone (n-gram, raw and language tokenizers do not).
_WORD_TOKENIZERS = (None, "simple", "whitespace")
_SEPARATOR = "memwalsepzqxj"
_BATCH = 512  # texts per Lance call
_TEXT = attrgetter("text")
_POSITION = attrgetter("position")


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
        # a list (custom_stop_words) as a tuple: an analyzer is hashable (caches are keyed by it)
        opts = tuple((k, _hashable(params[k])) for k in _OPTIONS if k in params)
        return cls(opts, bool(params.get("with_position", False)))

    @property
    def _kwargs(self) -> dict[str, Any]:
        """The options as ``lance.tokenize`` takes them (lists as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}

    @property
    def phrase_is_match(self) -> bool:
        """Whether Lance answers a phrase query like a match query: n-gram tokens all sit at
        position 0, so the phrase check passes any document holding one of them (measured)."""
        return dict(self.options).get("base_tokenizer") == "ngram"

    @property
    def empty_is_token(self) -> bool:
        """Whether an empty text is one token, ``''`` (the ``raw`` tokenizer), as Lance indexes
        it. The index pylance builds when it flushes a generation also holds a NULL text so."""
        return dict(self.options).get("base_tokenizer") == "raw"

    def tokenize(self, text: str | None) -> Doc:
        """``text`` as the index sees it (NULL: no tokens; an empty text is one token, ``''``,
        for the ``raw`` tokenizer (:attr:`empty_is_token`), and none for the others)."""
        if text is None or (not text and not self.empty_is_token):
            return _EMPTY
        toks = lance.tokenize(text, **self._kwargs)
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

    @cached_property
    def _separator(self) -> str | None:
        """The separator word as this analyzer emits it (None: texts are tokenized one by one)."""
        opts = dict(self.options)
        if opts.get("base_tokenizer") not in _WORD_TOKENIZERS:
            return None
        toks = self.tokens(_SEPARATOR)
        return toks[0] if len(toks) == 1 else None

    def tokenize_all(self, texts: Iterable[str | None]) -> list[Doc]:
        """Each text tokenized, like :meth:`tokenize` (word tokenizers: many texts per Lance call).

        Example:
            >>> a = Analyzer.from_params({"base_tokenizer": "simple", "remove_stop_words": True})
            >>> [d.tokens for d in a.tokenize_all(["the cats", None, "a dog and a cat"])]
            [('cat',), (), ('dog', 'cat')]
        """
        return self.tokenize_flat(texts).docs()

    def tokenize_flat(self, texts: Iterable[str | None]) -> Tokens:
        """Every text's tokens in one flat array (see :class:`Tokens`)."""
        texts = list(texts)
        parts = []
        for start in range(0, len(texts), _BATCH):
            chunk = texts[start : start + _BATCH]
            sep = self._separator
            parts.append((self._joined(chunk, sep) if sep is not None else None) or self._each(chunk))
        words = pa.concat_arrays([w for w, _, _ in parts]) if parts else pa.array([], pa.string())
        pos = np.concatenate([p for _, p, _ in parts]) if parts else np.zeros(0, np.int64)
        lengths = np.concatenate([n for _, _, n in parts]) if parts else np.zeros(0, np.int64)
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        firsts = pos[np.minimum(offsets[:-1], pos.size - 1)] if pos.size else np.zeros(len(texts), np.int64)
        return Tokens(words, pos - np.repeat(firsts, lengths), offsets)

    def _each(self, texts: Sequence[str | None]) -> tuple[pa.StringArray, np.ndarray, np.ndarray]:
        """``texts`` tokenized one by one: (words, positions, tokens per text)."""
        docs = [self.tokenize(t) for t in texts]
        words = pa.array([w for d in docs for w in d.tokens], pa.string())
        pos = np.array([p for d in docs for p in d.positions], dtype=np.int64)
        return words, pos, np.array([len(d) for d in docs], dtype=np.int64)

    def _joined(self, texts: Sequence[str | None], sep: str) -> tuple[pa.StringArray, np.ndarray, np.ndarray] | None:
        """``texts`` tokenized in one Lance call, joined by the separator word.

        None when a text holds the separator word itself (the count of separators
        says so): those texts are tokenized one by one instead.
        """
        toks = lance.tokenize(f" {_SEPARATOR} ".join(t or "" for t in texts), **self._kwargs)
        words = list(map(_TEXT, toks))
        if words.count(sep) != len(texts) - 1:
            return None
        flat = pa.array(words, pa.string())
        is_sep = np.asarray(pc.equal(flat, sep).to_numpy(zero_copy_only=False), dtype=bool)
        keep = ~is_sep
        lengths = np.bincount(np.cumsum(is_sep)[keep], minlength=len(texts)).astype(np.int64)
        pos = np.fromiter(map(_POSITION, toks), dtype=np.int64, count=len(toks))[keep]
        return flat.filter(pa.array(keep)), pos, lengths


@dataclass(frozen=True)
class Tokens:
    """The tokens of many texts in one flat array: text ``i`` holds ``words[offsets[i]:offsets[i + 1]]``."""

    words: pa.StringArray
    positions: np.ndarray  # relative to each text's first token
    offsets: np.ndarray  # len(texts) + 1

    def __len__(self) -> int:
        return int(self.offsets.size - 1)

    def doc(self, i: int) -> Doc:
        """Text ``i`` as a :class:`Doc`."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return Doc(tuple(self.words[a:b].to_pylist()), tuple(self.positions[a:b].tolist())) if b > a else _EMPTY

    def docs(self) -> list[Doc]:
        """Every text as a :class:`Doc`."""
        words = self.words.to_pylist()
        pos = self.positions.tolist()
        bounds = self.offsets.tolist()
        return [
            Doc(tuple(words[a:b]), tuple(pos[a:b])) if b > a else _EMPTY
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]


def _hashable(value: object) -> object:
    """A parameter value as an analyzer holds it: a list (``custom_stop_words``) as a tuple."""
    return tuple(value) if isinstance(value, list) else value
