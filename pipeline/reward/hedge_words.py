"""The words and signs that join candidate answers, in every language the verifiers read (`hedging.py` applies them).

The verifiers read answers in any script (`presentation.readable` takes digits of every script), so the hedge rule
reads the joining words of many languages, not English alone: "3 eller 1" and "3 或 1" are the hedge "3 or 1". The
lists cover the official languages of the European Union and of the United Nations and the most spoken languages
(Hindi, Bengali, Portuguese, Japanese, Punjabi, Marathi, Telugu, Turkish, Korean, Vietnamese, Tamil, Urdu,
Indonesian, Persian, Swahili, ...), each word a reader of that language takes to join alternatives:

- `OR`: "or". A word that is also a common word or name elsewhere (Finnish "tai" is Mount Tai, Welsh "neu" is
  German "new") is in `OR_BETWEEN_NUMBERS` instead: "or" only between two numbers. Dutch and Afrikaans "of" is
  in neither: between two numbers it is the English partitive ("3 of 5 people" answers 3), which the verifiers
  read far more often; the Dutch reader's "ofwel" stays.
- `TO`: a range ("3 bis 5", "3 à 5", "3から5"), between two numbers.
- `AND`: "and", between two numbers, to the kinds that read one number out of text (as English "and" is).
- `BETWEEN`: "between A and B" at the start of an answer.
- `OTHERWISE`: words that introduce another answer or a condition on this one ("alternatively", "otherwise",
  "unless", "if not"): they separate candidates wherever they stand.
- `DOUBT`: words of doubt ("maybe", "possibly", "probably", "could"): they separate candidates between two
  numbers, or after a separator (", maybe London", "(perhaps 1)"); alone beside one answer they name no second one.
- `GLUE`: words that may stand beside those between two candidates without joining anything themselves ("but",
  "it", "also", "be": "3, but it could also be 1").
Words of scripts written without spaces (Chinese, Japanese, Thai, Lao, Khmer, Burmese) are matched without spaces
around them (`UNSPACED`), except kana `か`, which is "or" only between two numbers.

Every word is compared as the reader sees it (`fold`): compatibility forms (full-width `ｏｒ`, mathematical
`𝐨𝐫`), small capitals (`ᴏʀ`), letters under accents or combining decoration (`o̲r̲`) and Latin look-alikes of other
scripts (Cyrillic `о`, Greek `ο`) read as their plain Latin letters, case ignored.
"""

from __future__ import annotations

import re
import unicodedata

OR = {
    "English": ("or", "nor"), "German": ("oder",), "French": ("ou", "ou bien"), "Portuguese": ("ou",),
    "Spanish": ("o bien",), "Italian": ("oppure",), "Dutch": ("ofwel",), "Swedish": ("eller",),
    "Danish": ("eller",), "Norwegian": ("eller",), "Icelandic": ("eða",), "Estonian": ("või",),
    "Lithuanian": ("arba",), "Polish": ("lub", "albo"), "Slovak": ("alebo",), "Hungarian": ("vagy",),
    "Romanian": ("sau",), "Greek": ("ή",), "Albanian": ("ose",), "Russian": ("или", "либо"),
    "Bulgarian": ("или",), "Serbian": ("или",), "Ukrainian": ("або", "чи"), "Belarusian": ("або", "ці"),
    "Turkish": ("veya", "yahut", "ya da"), "Azerbaijani": ("yaxud", "və ya"), "Uzbek": ("yoki",),
    "Kazakh": ("немесе",), "Mongolian": ("эсвэл",), "Georgian": ("ან",), "Armenian": ("կամ",),
    "Arabic": ("أو", "او"), "Persian": ("یا",), "Urdu": ("یا",), "Hebrew": ("או",), "Hindi": ("या", "अथवा"),
    "Nepali": ("वा", "अथवा"), "Bengali": ("বা", "অথবা"), "Punjabi": ("ਜਾਂ",), "Marathi": ("किंवा",),
    "Gujarati": ("અથવા",), "Tamil": ("அல்லது",), "Telugu": ("లేదా",), "Kannada": ("ಅಥವಾ",),
    "Malayalam": ("അല്ലെങ്കിൽ",), "Sinhala": ("හෝ",), "Vietnamese": ("hoặc",), "Indonesian": ("atau",),
    "Malay": ("atau",), "Javanese": ("utawa",), "Yoruba": ("tàbí",), "Amharic": ("ወይም",),
    "Korean": ("또는", "혹은", "아니면"), "Esperanto": ("aŭ",), "Latin": ("aut",),
    "Chinese": ("或", "或者", "还是", "還是"), "Japanese": ("または", "又は", "もしくは", "あるいは", "或いは"),
    "Thai": ("หรือ",), "Lao": ("ຫຼື",), "Khmer": ("ឬ",), "Burmese": ("သို့မဟုတ်",),
}  # fmt: skip
OR_BETWEEN_NUMBERS = {
    "Spanish": ("o", "u"), "Italian": ("o",), "Catalan": ("o",),
    "Tagalog": ("o",), "Finnish": ("tai", "vai"), "Latvian": ("vai",), "Czech": ("nebo",), "Slovenian": ("ali",),
    "Croatian": ("ili",), "Serbian": ("ili",), "Bosnian": ("ili",), "Maltese": ("jew",), "Irish": ("nó",),
    "Welsh": ("neu",), "Basque": ("edo",), "Vietnamese": ("hay",), "Swahili": ("au",), "Hausa": ("ko",),
    "Japanese": ("か",),
}  # fmt: skip
TO = {
    "English": ("to", "through"), "German": ("bis",), "French": ("à",), "Spanish": ("a", "hasta"),
    "Portuguese": ("a", "até"), "Italian": ("a",), "Dutch": ("tot",), "Swedish": ("till",), "Danish": ("til",),
    "Norwegian": ("til",), "Polish": ("do",), "Czech": ("do",), "Russian": ("до",), "Ukrainian": ("до",),
    "Arabic": ("إلى",), "Hindi": ("से",), "Vietnamese": ("đến", "tới"), "Indonesian": ("sampai", "hingga"),
    "Chinese": ("至", "到"), "Japanese": ("から",),
}  # fmt: skip
AND = {
    "English": ("and",), "German": ("und",), "French": ("et",), "Spanish": ("y", "e"), "Portuguese": ("e",),
    "Italian": ("e", "ed"), "Dutch": ("en",), "Swedish": ("och",), "Danish": ("og",), "Norwegian": ("og",),
    "Polish": ("i", "oraz"), "Czech": ("a",), "Hungarian": ("és",), "Finnish": ("ja",), "Russian": ("и",),
    "Ukrainian": ("і", "та"), "Turkish": ("ve",), "Arabic": ("و",), "Hindi": ("और",), "Indonesian": ("dan",),
    "Vietnamese": ("và",), "Chinese": ("和", "与", "與", "及"), "Japanese": ("と",), "Korean": ("그리고",),
}  # fmt: skip
BETWEEN = {
    "English": ("between",), "French": ("entre",), "Spanish": ("entre",), "Portuguese": ("entre",),
    "German": ("zwischen",), "Italian": ("tra", "fra"), "Dutch": ("tussen",), "Swedish": ("mellan",),
    "Danish": ("mellem",), "Polish": ("między",), "Czech": ("mezi",), "Russian": ("между",), "Ukrainian": ("між",),
}  # fmt: skip
OTHERWISE = {
    "English": ("alternatively", "otherwise", "unless", "if not", "or else", "failing that"),
    "German": ("alternativ", "andernfalls", "sonst", "oder aber"), "French": ("sinon", "autrement", "à moins que"),
    "Spanish": ("alternativamente", "si no", "de lo contrario", "a menos que"),
    "Portuguese": ("alternativamente", "senão", "caso contrário", "ou então"),
    "Italian": ("alternativamente", "altrimenti", "a meno che"), "Dutch": ("anders gezegd", "tenzij"),
    "Swedish": ("annars",), "Danish": ("ellers",), "Norwegian": ("ellers",), "Polish": ("inaczej", "alternatywnie"),
    "Russian": ("иначе", "в противном случае"), "Ukrainian": ("інакше",), "Turkish": ("yoksa", "aksi halde"),
    "Hindi": ("अन्यथा", "नहीं तो"), "Arabic": ("وإلا",), "Indonesian": ("jika tidak",),
    "Chinese": ("否则", "否則", "不然", "要么", "要麼"), "Japanese": ("さもなければ",), "Korean": ("그렇지 않으면",),
}  # fmt: skip
DOUBT = {
    "English": ("maybe", "perhaps", "possibly", "probably", "likely", "else", "could", "might", "may be"),
    "German": ("vielleicht", "möglicherweise", "eventuell", "wahrscheinlich", "womöglich"),
    "French": ("peut-être", "peut être", "probablement", "éventuellement", "possiblement"),
    "Spanish": ("quizás", "quizá", "tal vez", "posiblemente", "probablemente", "a lo mejor"),
    "Portuguese": ("talvez", "possivelmente", "provavelmente"),
    "Italian": ("forse", "probabilmente", "possibilmente", "magari"),
    "Dutch": ("misschien", "mogelijk", "waarschijnlijk", "wellicht"), "Swedish": ("kanske", "möjligen", "troligen"),
    "Danish": ("måske", "muligvis"), "Norwegian": ("kanskje",), "Finnish": ("ehkä",), "Hungarian": ("talán",),
    "Romanian": ("poate", "probabil"), "Greek": ("ίσως",), "Polish": ("może", "prawdopodobnie", "ewentualnie"),
    "Czech": ("možná",), "Russian": ("может быть", "возможно", "вероятно", "наверное"),
    "Ukrainian": ("можливо", "мабуть"), "Turkish": ("belki", "muhtemelen"), "Indonesian": ("mungkin", "barangkali"),
    "Vietnamese": ("có lẽ", "có thể"), "Hindi": ("शायद", "संभवतः"), "Urdu": ("شاید",), "Persian": ("شاید",),
    "Arabic": ("ربما",), "Hebrew": ("אולי",), "Swahili": ("labda",),
    "Chinese": ("可能", "也许", "也許", "或许", "或許", "大概"),
    "Japanese": ("たぶん", "多分", "おそらく", "恐らく", "もしかしたら", "かもしれない"), "Korean": ("아마", "아마도", "어쩌면"),
}  # fmt: skip
GLUE = ("but", "though", "although", "it", "it's", "may", "also", "even", "be", "is", "was", "if",
        "not", "just", "either", "about", "so", "aber", "mais", "pero", "mas", "ma", "maar", "men", "но", "але",
        "ale", "但", "但是", "是", "也", "还", "還")  # fmt: skip

# scripts written without spaces between words
_UNSPACED_SCRIPTS = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR")


def words(*tables: dict[str, tuple[str, ...]]) -> frozenset[str]:
    """Every word of the tables, folded (`fold`)."""
    return frozenset(fold(word) for table in tables for group in table.values() for word in group)


def is_unspaced(word: str) -> bool:
    """Whether `word` is written in a script without spaces between words (matched without spaces around it)."""
    return any(unicodedata.name(ch, "").startswith(_UNSPACED_SCRIPTS) for ch in word)


# Latin small capitals (no compatibility decomposition: NFKC leaves `ᴏʀ` alone), and the letters of other scripts
# that look like Latin ones, read as those
_SMALL_CAPITALS = dict(zip("ᴀʙᴄᴅᴇꜰɢʜɪᴊᴋʟᴍɴᴏᴘꞯʀꜱᴛᴜᴠᴡʏᴢ", "abcdefghijklmnopqrstuvwyz", strict=True))
_LOOK_ALIKES = dict(zip("аеорсхуіјѕԁһԛԝοαρτυνικχ", "aeopcxyijsdhqwoaptuvikx", strict=True))
_FOLD_TABLE = str.maketrans({**_SMALL_CAPITALS, **_LOOK_ALIKES})


# combining marks that decorate Latin, Greek and Cyrillic letters (accents, `o̲r̲`, `o̶r̶`); not the vowel signs of
# other scripts, nor kana's voicing marks (`が` is not `か`)
_DECORATION_RE = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]")


def fold(text: str) -> str:
    """`text` as the hedge rule compares it: compatibility forms as their plain letters (NFKC), without accents and
    other combining decoration, small capitals and Latin look-alikes as Latin letters, case folded. Linear; ASCII
    text is only lower-cased."""
    if text.isascii():
        return text.lower()
    bare = _DECORATION_RE.sub("", unicodedata.normalize("NFKD", text))
    return unicodedata.normalize("NFKC", bare).casefold().translate(_FOLD_TABLE)
