"""The `rouge` package's (pltrdy/rouge) summary-level ROUGE-L, written again from its definition for the
metric tests of LooGLE (recall) and the needle (F): sentences split on ".", the union of the words of each
reference sentence's LCS with every hypothesis sentence, traced back as the package traces it."""


def sentences(text: str) -> list[str]:
    """The package's sentences: the text split on ".", empty pieces dropped, spaces collapsed."""
    return [" ".join(piece.split()) for piece in text.split(".") if piece]


def lcs_words(x: list[str], y: list[str]) -> set[str]:
    """The words of the LCS of x and y as the package traces it back (up when the cell above is larger)."""
    table = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i in range(1, len(x) + 1):
        for j in range(1, len(y) + 1):
            same = x[i - 1] == y[j - 1]
            table[i][j] = table[i - 1][j - 1] + 1 if same else max(table[i - 1][j], table[i][j - 1])
    words, i, j = set(), len(x), len(y)
    while i and j:
        if x[i - 1] == y[j - 1]:
            words.add(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def union_lcs(reference: list[str], hypothesis: list[str]) -> set[str]:
    """The union over reference sentences of their LCS words with each hypothesis sentence."""
    union = set()
    for sentence in reference:
        for candidate in hypothesis:
            union |= lcs_words(sentence.split(" "), candidate.split(" "))
    return union


def distinct_words(text_sentences: list[str]) -> set[str]:
    return {word for sentence in text_sentences for word in sentence.split(" ")}
