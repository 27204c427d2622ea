"""The book's own machinery, not a chapter's piece: the book's model and the loss ladder,
one way of scoring every model, the cache of results computed once, and the helpers that show
source code and sampling forms on the page."""
