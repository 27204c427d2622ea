"""The book's own machinery: the models and results its chapters show, trained or measured once
and cached (trained_model, ladder, scoring, compression, evaluations, chat_model, preferences, on
results_cache; models makes them ahead of the build), and the page's helpers (show, widgets,
web_export). Two pieces are also taught: chapter 9 reads widgets' click handler, and chapter 14
reads dynamic_eval's read_and_learn."""
