"""Sphinx extension: the book's bibliography set-up, loaded from _config.yml.

It registers the pybtex style ``authoryear``: the ``plain`` style (sorted by author, year and
title) whose labels read "Vaswani et al., 2017", so that the bibliography page shows the same
author-year form as the citations in the text (``bibtex_reference_style: author_year``).
"""

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle


def _last_name(person):
    return str(Text(*person.rich_last_names).render_as("text"))


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Gage, 1994", "Kingma and Ba, 2015", "Vaswani et al., 2017"; a letter is added
    after the year when two entries would otherwise share a label ("2013a", "2013b")."""

    def format_labels(self, sorted_entries):
        labels = [self._label(entry) for entry in sorted_entries]
        repeated = {label for label in labels if labels.count(label) > 1}
        seen = {}
        for label in labels:
            if label in repeated:
                seen[label] = seen.get(label, 0) + 1
                label += "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
            yield label

    @staticmethod
    def _label(entry):
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_last_name(person) for person in persons]
        if len(persons) == 0:
            who = entry.key
        elif len(persons) == 1:
            who = names[0]
        elif len(persons) == 2 and str(persons[1]) != "others":
            who = f"{names[0]} and {names[1]}"
        else:
            who = f"{names[0]} et al."
        return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(PlainStyle):
    default_label_style = AuthorYearLabelStyle


def setup(app):
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
