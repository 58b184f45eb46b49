"""A Flower App whose server records every client update for a gradjax audit."""
