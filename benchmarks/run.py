"""`make bench`: nothing to measure yet (the Exports issue adds the export benchmark)."""

if __name__ == "__main__":
    print("bench: nothing yet")
