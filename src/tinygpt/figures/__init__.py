"""The book's figures: a small drawing layer on matplotlib and the diagrams of the chapters,
drawn from the package's own objects."""
