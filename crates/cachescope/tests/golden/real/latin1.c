int main(void)
{
    /* café au lait: not UTF-8 */
    return 0;
}
